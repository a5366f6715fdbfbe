"""The OxyGen engine: configuration, observation inputs, model loading, the control cycle."""

"""The OxyGen engine: configuration, model loading, the control cycle and its outputs."""

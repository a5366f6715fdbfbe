"""The input and output transforms around the network: norm stats, images, prompts, text."""

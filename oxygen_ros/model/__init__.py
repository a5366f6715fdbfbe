"""π0.5 in PyTorch: vision tower, VLM expert, action expert, prefill / denoise / decode."""

"""Console scripts: bags, demo, benchmark, export, tokenizer fetch."""

"""Training plumbing every trainer shares: backends, the data-set loop, data, metrics, options."""

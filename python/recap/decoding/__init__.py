"""The public API and the request path: `Decoder`, `generate`, the request checks, the
step loop for one request and for a batch, continuous batching, acceptance and sampling,
outputs and statistics, the drafters and the configuration."""

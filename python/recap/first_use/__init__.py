"""What a decoder measures once per model before its first request: the conformance probe,
the cost curve and the linear-layout choice. It imports `recap.verify` and `recap.state`."""

"""The sidecar's own gRPC API (loadaware.v1): Explain, ListEndpoints, GetConfig."""

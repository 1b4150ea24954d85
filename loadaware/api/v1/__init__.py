"""Generated from proto/loadaware/v1/loadaware.proto by `make proto`; do not edit the *_pb2* modules."""

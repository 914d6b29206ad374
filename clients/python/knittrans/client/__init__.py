"""gRPC clients of the KnitTrans services (light: grpcio and protobuf only)."""

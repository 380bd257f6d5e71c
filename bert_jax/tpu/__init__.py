"""Compiling for TPU slices without TPUs: topologies, ahead-of-time compiles, estimates."""

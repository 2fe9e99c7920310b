"""The EAGLE-3 draft model, its training-time-test unroll, losses and metrics."""

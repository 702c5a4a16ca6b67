"""Energy-optimal power modes for DNN inference under a latency bound."""

__version__ = "0.1.0"

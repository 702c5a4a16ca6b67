"""The host CPU as a device, and its RAPL meter."""

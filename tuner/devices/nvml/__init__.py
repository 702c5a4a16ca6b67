"""NVIDIA datacenter GPUs through NVML: the device and its energy meter."""

"""Sources of samples: NVML, the host, the attached process, the simulator, replay."""

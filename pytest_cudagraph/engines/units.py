"""Byte units: binary, as NVML and torch count them."""

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

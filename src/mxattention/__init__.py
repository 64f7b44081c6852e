"""mxattention: 4-bit MXFP4 attention as accurate as FP16, with no calibration data."""

__version__ = "0.1.0"

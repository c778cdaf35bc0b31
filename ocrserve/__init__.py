"""ocrserve: serve document OCR at scale.

The gateway (``ocrserve.api``) takes documents over REST, normalizes their pages to a pixel
budget (``ocrserve.preprocess``) and runs them through one OCR engine (``ocrserve.engines``).
"""

__version__ = "0.1.0"

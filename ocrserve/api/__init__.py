"""The REST gateway (FastAPI): ``create_app(config)`` builds it."""

from ocrserve.api.app import create_app

__all__ = ["create_app"]

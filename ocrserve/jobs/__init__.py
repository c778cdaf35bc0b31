"""Durable bulk jobs: intake (the 202), the worker that runs their pages, results, webhooks, retention."""

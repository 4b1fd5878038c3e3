"""Test helpers for pisub: a scripted fake LLM server and pi configuration for it."""

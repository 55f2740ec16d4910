"""Thin shim: pyproject.toml is the source of truth (kept for tools that still call setup.py)."""

from setuptools import setup

setup()

"""Notebook views of a running engine: LiveView (ipywidgets), its model state and renders."""

from __future__ import annotations

from toolkit.notebook.live import LiveView, widgets_available
from toolkit.notebook.state import LiveModel, LiveState

__all__ = ["LiveView", "LiveModel", "LiveState", "widgets_available"]

"""Helpers that drive the course in a real JupyterLab through headless Chromium.

`lab.LabServer` starts an isolated JupyterLab; `lab.NotebookPage` drives one notebook in it.
Used by tests/test_browser.py.
"""

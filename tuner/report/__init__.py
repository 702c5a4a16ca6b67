"""The characterization report: devices, power modes and batch sizes measured and written up as one folder.

``collect`` measures what is missing (or reuses a study's trials), ``data``
holds the versioned result, ``plots`` draws its figures and ``render``
writes report.md and a self-contained report.html.
"""

"""Meters that live outside the device: MLPerf's power director (PTD), a meter served over the network, plugins.

``--meter`` names one (``ptd://host:port``, ``remote://host:port``,
``py:package.module:Class`` or a ``powertune.meters`` entry point); the
device's own meter is then read alongside it, so a trial records both, and
the named one is what the objective uses.
"""

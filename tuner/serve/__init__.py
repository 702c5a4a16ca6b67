"""Adaptive serving: rate-band policies (tune plan), the governor (tune govern) and trace replay (tune replay)."""

"""Measurement windows (MLPerf LoadGen) and the meter protocol that brackets them."""

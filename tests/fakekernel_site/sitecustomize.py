"""Child processes of the Jetson tests obey the fake kernel's rules (see tests/fakekernel.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fakekernel

fakekernel.register_from_environment()

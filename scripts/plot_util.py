"""Shared by scripts/plot_metrics.py and scripts/plot_sweep.py: matplotlib's pyplot on the Agg backend (no display)."""
import os
import sys


def pyplot(script, name):
    """matplotlib.pyplot with the Agg backend. Without matplotlib, re-runs `script` (the caller's __file__) under
    /usr/bin/python3 (Debian's python3-matplotlib belongs to it, which may not be the python3 on PATH), or exits
    naming `name` and how to install it."""
    try:
        import matplotlib
    except ImportError:
        if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.path.exists("/usr/bin/python3"):
            os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(script), *sys.argv[1:]])
        sys.exit(f"{name}: needs matplotlib (Debian: apt-get install python3-matplotlib; elsewhere: pip install matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

"""The example program: a day's rollup (here, a line on stdout naming the day)."""
import sys

day = sys.argv[1]
print(f"rolled up {day} with Python {sys.version_info.major}.{sys.version_info.minor}")

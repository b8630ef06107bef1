import sys
from pathlib import Path

# Tests import the fixture builders from the repository's fixtures/ package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

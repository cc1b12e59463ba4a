"""gpuremote._replay (native/replay.c), where it was built from the replay.c this code was written for.

Its API number is the contract: a build of another replay.c (an editable install not rebuilt) is
ignored rather than misread. `replay` is None where there is no such build; GPUREMOTE_NATIVE=0 is
checked by the users (the replay loop per session, the ledger at import)."""

API = 5

try:
    from gpuremote import _replay as replay
except ImportError:
    replay = None
if getattr(replay, "API", None) != API:
    replay = None

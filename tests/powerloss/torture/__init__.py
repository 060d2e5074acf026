"""Power-loss torture: each component (the engine, the supervisor with its servers, pull, the
trainer's checkpoints) is recorded once on the forgetting filesystem, its power then cut at many
points of the recording (every crash point of agents/rundir/crashpoint.py and random moments),
and only its recovery run on each crash state, which must lose nothing it had claimed, hold
nothing twice and count exactly. benchmarks/powerloss.py runs it at full size."""

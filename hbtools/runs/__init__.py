"""What a conversion run needs around its stages: the artefact transaction on ``working_dir``,
the memory check made before any work, the per-step timings and the progress of long loops."""

"""One-off analyses: each a launcher that answered one question about the method or the worlds
(what it measured is on its page under ``docs/results/``), kept runnable but no part of the
suite (``experiments.main`` with a table config) or of the benchmarks (``experiments/bench/``).

    python -m experiments.studies.transfer_anatomy         where a cross-model transfer loses
    python -m experiments.studies.strength_frontier        task gain against the controls' cost
    python -m experiments.studies.adapter_holdout          adapter recipes on held-out probes
    python -m experiments.studies.source_holdout           source step counts and lrs on held-out rows
    python -m experiments.studies.pretrain_holdout         audio pretraining steps on held-out clips
    python -m experiments.studies.same_architecture_check  GradFix and Theseus on twin families
    python -m experiments.studies.probe_world              zero-shot / linear probe of a toy world
    python -m experiments.studies.probe_audio_world        the same for an audio world
    python -m experiments.studies.linearity_check          Proposition 1 on random arrays
"""

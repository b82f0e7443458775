"""Helpers the tests share: tiny reference checkpoints (``fixtures``, ``siglip_fixtures``,
``eva_fixtures``; ``audio_fixtures``: wav bytes and randomised CLAP weights), the torchvision stand-in for open_clip's import (``torchvision_stub``) and
the in-process runner of launcher refusals (``launcher_refusals``)."""

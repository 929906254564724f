"""OmegaConf resolvers the configs use: ${repo:} is the repository root, so data paths work from any cwd."""
from pathlib import Path

from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "configs"


def register_resolvers():
    if not OmegaConf.has_resolver("repo"):
        OmegaConf.register_new_resolver("repo", lambda: str(REPO))

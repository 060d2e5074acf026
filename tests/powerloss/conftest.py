from tests.powerloss.harness import forgetful_dir

__all__ = ["forgetful_dir"]

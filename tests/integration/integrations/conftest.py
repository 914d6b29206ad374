"""Nothing is downloaded: transformers and TRL run offline in these tests (and in the processes they start)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

"""The guide's listing 003_12 (shared/seeds/003_*.txt, code block 12), as printed; only import lines differ."""
from tests.seed_examples.listings._helpers import create_dummy_batch

# recipe/my_task/test_my_trainer.py
import pytest
from omegaconf import OmegaConf
from streamrl.api import Batch
from tests.seed_examples.listings.s003_01 import MyCustomTrainer

def test_custom_trainer_prepare_batch():
    config = OmegaConf.create({
        "algorithm": {"my_param": 0.5},
        "train_service": {"world_size": 1, "backend": "self-hosted", "url": "http://localhost"}
    })

    trainer = MyCustomTrainer(config)

    # Create dummy batch
    batch = create_dummy_batch()

    # Test _prepare_batch
    prepared_batch, metrics = trainer._prepare_batch(batch)

    assert "advantages" in prepared_batch.values
    assert "advantage_mean" in metrics

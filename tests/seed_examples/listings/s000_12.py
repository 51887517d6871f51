"""The guide's listing 000_12 (shared/seeds/000_*.txt, code block 12), as printed; only import lines differ."""

# test_my_worker.py
import pytest
from omegaconf import DictConfig
from tests.seed_examples.listings._helpers import MyWorker

def test_query_formatting():
    config = DictConfig({"temperature": 0.7})
    worker = MyWorker(config)

    task = {"question": "What is 2+2?", "context": "Math problem"}
    query = worker._format_query(task)

    assert "What is 2+2?" in query
    assert "Math problem" in query

def test_answer_extraction():
    config = DictConfig({"temperature": 0.7})
    worker = MyWorker(config)

    response = "The answer is <answer>4</answer>"
    answer = worker._extract_answer(response)

    assert answer == "4"

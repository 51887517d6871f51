"""The guide's listing 002_05 (shared/seeds/002_*.txt, code block 5), as printed; only import lines differ."""

import pandas as pd

# Prepare training data
train_data = [
    {
        "prompt": "What is 2+2?",
        "answer": "4",
        "difficulty": "easy"
    },
    # ... more examples
]

df = pd.DataFrame(train_data)
df.to_parquet("train.parquet")

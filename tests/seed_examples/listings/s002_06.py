"""The guide's listing 002_06 (shared/seeds/002_*.txt, code block 6), as printed; only import lines differ."""
import pandas as pd

def validate_data(parquet_file: str):
    df = pd.read_parquet(parquet_file)

    # Check required columns
    assert "prompt" in df.columns, "Missing 'prompt' column"
    assert "answer" in df.columns, "Missing 'answer' column"

    # Check data quality
    assert len(df) > 0, "Empty dataset"
    assert df["prompt"].notna().all(), "Null prompts found"

    print(f"Dataset valid: {len(df)} examples")

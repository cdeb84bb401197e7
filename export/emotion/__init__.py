"""The emotion stage: all-MiniLM-L6-v2 sentence embeddings -> the served `emotion_encoder`."""

"""`lace explore`: a local web app to look inside a model's embeddings, its concept atoms and their edits."""

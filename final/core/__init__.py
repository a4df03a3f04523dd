"""What every layer of final/ shares and nothing else: configuration, sampling parameters,
request outputs, the model's config.json, device choice, request limits and the user-error type.
It imports no other part of final/."""

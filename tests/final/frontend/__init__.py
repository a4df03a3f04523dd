"""final/frontend: detokenizing, the token path to the server, sampling defaults."""

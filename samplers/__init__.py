"""Generation paths over the TokenDenoiser protocol (not yet built)."""

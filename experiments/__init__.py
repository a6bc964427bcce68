"""gpfl: experiments."""

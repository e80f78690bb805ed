"""Release helpers behind ``make dist``; not shipped."""

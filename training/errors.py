"""The one error type the job reports as a message instead of a traceback."""


class BadInput(ValueError):
    """Bad arguments, data, tokenizer or launch environment.

    The message names the setting, the value and what is allowed, and says what to do. The job
    stops every rank with exit code BAD_INPUT and prints the message once, on rank 0.
    """

"""vLLM serving evaluation suite: A/B end-to-end comparisons of vLLM server arms.

Data flows one way: scenario -> servers -> raw records -> statistics -> reports.
"""

__version__ = "0.2.0"

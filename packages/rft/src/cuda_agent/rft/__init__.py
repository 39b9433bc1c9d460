"""Rejection fine-tuning (RFT): trajectory selection and policy-token SFT."""

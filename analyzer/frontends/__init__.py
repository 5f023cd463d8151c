"""Frontends lower a model format into ``passes.ir.Graph``; passes never see the format."""

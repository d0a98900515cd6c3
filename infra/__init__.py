"""The Pulumi program for a trial cluster (issue #7): hosts, volumes, network, guards, bucket.

Not built yet. Pure functions (prices, estimates, validation) will live beside the program so they
test without Pulumi's mocks; the program stays importable under `pulumi.runtime.set_mocks`.
"""

"""Pure planning code shared by the Pulumi program, the Fabric tasks and the training job.

Nothing in this package imports pulumi, boto3, fabric, paramiko or torch: it decides, it never acts.
"""

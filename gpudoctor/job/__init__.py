"""The job being judged, as opposed to the machine gpudoctor runs on.

`layout` says where the ranks are (world size, ranks per node, nodes) and gives the one
environment accessor the checks use (`job_env`: this process's variables plus what a
--sbatch script exports); `shape` reads the job's SLURM resources and launcher.
"""

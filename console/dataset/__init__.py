"""`fleetdeck dataset NODE|CAMPAIGN --to DIR [--push REPO_ID]`: a verified run's current lines
as Parquet shards with a Hugging Face dataset card, built on the console from a pulled copy
(or, for a campaign, from its S3 prefix through its commits). Never imports Textual."""
